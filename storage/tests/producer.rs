//! Idempotent appends (`StreamLog::append_tagged`): each shard's producer table answers a
//! retry of a stored batch with the original offsets and stores nothing, refuses gaps, old
//! and mismatched sequence numbers, survives a reopen (rebuilt from the tags in the log),
//! forgets what a truncation cut, and stays within `producers_per_shard_max`.

mod common;

use bytes::Bytes;
use common::{read_all, run, small_config};
use felix_proto::{AckMode, Offset, ProducerId, ProducerTag, Record, ShardId};
use felix_storage::{
    AppendOutcome, RetentionConfig, StorageConfig, StorageError, StreamLog, WriteSync,
    PRODUCER_SEQ_WINDOW,
};
use futures_lite::future::zip;
use rand::{Rng, SeedableRng};

const SHARDS: [ShardId; 2] = [ShardId(0), ShardId(1)];
const S0: ShardId = ShardId(0);

async fn open(path: &std::path::Path, config: &StorageConfig) -> StreamLog {
    StreamLog::open("t/ns/p", &path.join("log"), &SHARDS, config, RetentionConfig::default())
        .await
        .expect("log opens")
        .0
}

fn tag(producer: u64, seq: u32) -> Option<ProducerTag> {
    Some(ProducerTag { producer: ProducerId(producer), seq })
}

/// `n` records whose values name the producer, the sequence number and the attempt, so a
/// retry stored by mistake is visible in a read.
fn recs(producer: u64, seq: u32, attempt: u32, n: usize, value_len: usize) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let mut v = format!("p{producer}-s{seq}-a{attempt}-r{i}").into_bytes();
            v.resize(value_len.max(v.len()), b'.');
            Record::unkeyed(Bytes::from(v))
        })
        .collect()
}

fn appended(base: u64, count: u32) -> AppendOutcome {
    AppendOutcome { base_offset: Offset(base), record_count: count, duplicate: false }
}

fn duplicate(base: u64, count: u32) -> AppendOutcome {
    AppendOutcome { base_offset: Offset(base), record_count: count, duplicate: true }
}

#[test]
fn a_retry_gets_the_original_offsets_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let log = open(&path, &StorageConfig::new(&path)).await;
        let mut originals = Vec::new();
        for seq in 0..6u32 {
            let r = recs(1, seq, 0, 3, 50);
            let out = log.append_tagged(S0, &r, 10, AckMode::Written, tag(1, seq)).await.unwrap();
            assert_eq!(out, appended(u64::from(seq) * 3, 3));
            originals.push(r);
            // Untagged appends go on around the tagged ones, on both shards.
            log.append(ShardId(1), &recs(9, seq, 0, 1, 10), 10, AckMode::None).await.unwrap();
        }
        let before = log.stats();
        for (i, ack) in [AckMode::None, AckMode::Written, AckMode::Durable].into_iter().enumerate()
        {
            for seq in [0u32, 3, 5] {
                let retry = recs(1, seq, 1 + i as u32, 3, 50);
                let out = log.append_tagged(S0, &retry, 11, ack, tag(1, seq)).await.unwrap();
                assert_eq!(out, duplicate(u64::from(seq) * 3, 3), "{ack:?} retry of {seq}");
            }
        }
        let after = log.stats();
        assert_eq!(after.duplicates, before.duplicates + 9);
        assert_eq!(after.appends, before.appends);
        assert_eq!(after.records, before.records);
        assert_eq!(log.next_offset(S0).unwrap(), Offset(18));
        assert_eq!(log.next_offset_assigned(S0), 18);
        let stored = read_all(&log, S0).await;
        assert_eq!(stored.len(), 6);
        for (seq, b) in stored.iter().enumerate() {
            assert_eq!(b.records, originals[seq], "batch {seq} holds the original only");
            assert_eq!(b.producer, tag(1, seq as u32));
            assert_eq!(b.base_offset, Offset(seq as u64 * 3));
        }
        assert!(read_all(&log, ShardId(1)).await.iter().all(|b| b.producer.is_none()));
        // The next sequence number still appends.
        let out =
            log.append_tagged(S0, &recs(1, 6, 0, 1, 5), 12, AckMode::Durable, tag(1, 6)).await;
        assert_eq!(out.unwrap(), appended(18, 1));
    });
}

#[test]
fn a_retry_while_the_original_is_queued_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let log = open(&path, &StorageConfig::new(&path)).await;
        for (seq, ack) in
            [AckMode::None, AckMode::Written, AckMode::Durable].into_iter().enumerate()
        {
            let seq = seq as u32;
            for retry_ack in [AckMode::None, AckMode::Written, AckMode::Durable] {
                let seq = seq * 3 + retry_ack as u32;
                let original = recs(2, seq, 0, 2, 100);
                let retry = recs(2, seq, 1, 2, 100);
                // Both are offered before either is awaited: the retry is enqueued while the
                // original sits in the queue (or is being written).
                let (a, b) = zip(
                    log.append_tagged(S0, &original, 1, ack, tag(2, seq)),
                    log.append_tagged(S0, &retry, 1, retry_ack, tag(2, seq)),
                )
                .await;
                let a = a.unwrap();
                assert!(!a.duplicate);
                assert_eq!(b.unwrap(), duplicate(a.base_offset.0, 2), "{ack:?}/{retry_ack:?}");
                if retry_ack != AckMode::None {
                    // The retry answered only once the original was written.
                    assert!(log.next_offset(S0).unwrap().0 >= a.base_offset.0 + 2);
                }
            }
        }
        log.flush().await.unwrap();
        let stored = read_all(&log, S0).await;
        assert_eq!(stored.len(), 9);
        for (i, b) in stored.iter().enumerate() {
            assert_eq!(b.records, recs(2, i as u32, 0, 2, 100));
        }
        assert_eq!(log.stats().duplicates, 9);
    });
}

#[test]
fn a_durable_retry_waits_for_a_flush_that_covers_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        config.write_sync = WriteSync::Fdatasync;
        let log = open(&path, &config).await;
        // Original written, not durable: the durable retry needs a flush.
        log.append_tagged(S0, &recs(3, 0, 0, 1, 10), 1, AckMode::Written, tag(3, 0)).await.unwrap();
        let flushes = log.stats().flushes;
        let out =
            log.append_tagged(S0, &recs(3, 0, 1, 1, 10), 1, AckMode::Durable, tag(3, 0)).await;
        assert_eq!(out.unwrap(), duplicate(0, 1));
        assert!(log.stats().flushes > flushes, "a durable retry of unflushed data flushed");
        // Original durable: the retry answers without another flush.
        let flushes = log.stats().flushes;
        let out =
            log.append_tagged(S0, &recs(3, 0, 2, 1, 10), 1, AckMode::Durable, tag(3, 0)).await;
        assert_eq!(out.unwrap(), duplicate(0, 1));
        assert_eq!(log.stats().flushes, flushes);
        // Original queued with no ack: the durable retry waits for its write and a flush.
        let flushes = log.stats().flushes;
        let (a, b) = zip(
            log.append_tagged(S0, &recs(3, 1, 0, 1, 10), 1, AckMode::None, tag(3, 1)),
            log.append_tagged(S0, &recs(3, 1, 1, 1, 10), 1, AckMode::Durable, tag(3, 1)),
        )
        .await;
        assert_eq!(a.unwrap(), appended(1, 1));
        assert_eq!(b.unwrap(), duplicate(1, 1));
        assert!(log.stats().flushes > flushes);
        assert_eq!(log.next_offset(S0).unwrap(), Offset(2));
    });
}

/// With O_DSYNC segments a written original is durable: a durable retry of it is answered
/// at once, without a flush.
#[test]
fn with_dsync_writes_a_durable_retry_of_a_written_original_needs_no_flush() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        config.write_sync = WriteSync::Dsync;
        let log = open(&path, &config).await;
        log.append_tagged(S0, &recs(3, 0, 0, 1, 10), 1, AckMode::Written, tag(3, 0)).await.unwrap();
        let out =
            log.append_tagged(S0, &recs(3, 0, 1, 1, 10), 1, AckMode::Durable, tag(3, 0)).await;
        assert_eq!(out.unwrap(), duplicate(0, 1));
        assert_eq!(log.stats().flush_latency_us.len(), 0, "no flush");
    });
}

#[test]
fn gaps_old_and_mismatched_sequence_numbers_are_typed_errors_that_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let log = open(&path, &StorageConfig::new(&path)).await;
        let p = ProducerId(4);
        for seq in 0..10u32 {
            log.append_tagged(S0, &recs(4, seq, 0, 3, 10), 1, AckMode::Written, tag(4, seq))
                .await
                .unwrap();
        }
        let errors = log.stats().append_errors;
        let ack = AckMode::Durable;
        // A gap: 10 is next, 12 skips 11.
        let e = log.append_tagged(S0, &recs(4, 12, 0, 3, 10), 1, ack, tag(4, 12)).await;
        match e {
            Err(ref err @ StorageError::OutOfOrderSequence { shard, producer, expected, got }) => {
                assert_eq!((shard, producer, expected, got), (S0, p, 10, 12));
                assert!(err.to_string().contains("resend"), "{err}");
            }
            other => panic!("{other:?}"),
        }
        // Older than the window (the last PRODUCER_SEQ_WINDOW = 8 batches: 2..=9).
        assert_eq!(PRODUCER_SEQ_WINDOW, 8);
        for seq in [0u32, 1] {
            let e = log.append_tagged(S0, &recs(4, seq, 1, 3, 10), 1, ack, tag(4, seq)).await;
            match e {
                Err(
                    ref err @ StorageError::SequenceTooOld { producer, seq: s, oldest_kept, .. },
                ) => {
                    assert_eq!((producer, s, oldest_kept), (p, seq, 2));
                    assert!(err.to_string().contains("do not retry"), "{err}");
                }
                other => panic!("{other:?}"),
            }
        }
        // A retry with another record count.
        let e = log.append_tagged(S0, &recs(4, 5, 1, 2, 10), 1, ack, tag(4, 5)).await;
        match e {
            Err(
                ref err @ StorageError::SequenceMismatch {
                    seq, stored_records, retry_records, ..
                },
            ) => {
                assert_eq!((seq, stored_records, retry_records), (5, 3, 2));
                assert!(err.to_string().contains("same batch"), "{err}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(log.stats().append_errors, errors + 4);
        // Nothing was stored and no offset was taken.
        assert_eq!(log.next_offset(S0).unwrap(), Offset(30));
        assert_eq!(log.next_offset_assigned(S0), 30);
        let stored = read_all(&log, S0).await;
        assert_eq!(stored.len(), 10);
        for (seq, b) in stored.iter().enumerate() {
            assert_eq!(b.records, recs(4, seq as u32, 0, 3, 10));
        }
        // The oldest of the window is still a duplicate; the next one appends.
        let out = log.append_tagged(S0, &recs(4, 2, 1, 3, 10), 1, ack, tag(4, 2)).await;
        assert_eq!(out.unwrap(), duplicate(6, 3));
        let out = log.append_tagged(S0, &recs(4, 10, 0, 3, 10), 1, ack, tag(4, 10)).await;
        assert_eq!(out.unwrap(), appended(30, 3));
        // Another producer is independent, and may start anywhere.
        let out = log.append_tagged(S0, &recs(5, 77, 0, 1, 10), 1, ack, tag(5, 77)).await;
        assert_eq!(out.unwrap(), appended(33, 1));
    });
}

#[test]
fn sequence_numbers_wrap_at_u32_max_also_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let seqs = [u32::MAX - 2, u32::MAX - 1, u32::MAX, 0, 1];
        for (i, seq) in seqs.into_iter().enumerate() {
            let out = log
                .append_tagged(S0, &recs(6, seq, 0, 1, 10), 1, AckMode::Written, tag(6, seq))
                .await;
            assert_eq!(out.unwrap(), appended(i as u64, 1), "seq {seq}");
        }
        log.clone().close().await.unwrap();
        drop(log);
        let log = open(&path, &config).await;
        for (i, seq) in seqs.into_iter().enumerate() {
            let out = log
                .append_tagged(S0, &recs(6, seq, 1, 1, 10), 1, AckMode::Written, tag(6, seq))
                .await;
            assert_eq!(out.unwrap(), duplicate(i as u64, 1), "seq {seq}");
        }
        let e = log.append_tagged(S0, &recs(6, 3, 0, 1, 10), 1, AckMode::Written, tag(6, 3)).await;
        assert!(matches!(e, Err(StorageError::OutOfOrderSequence { expected: 2, got: 3, .. })));
        let e = log
            .append_tagged(S0, &recs(6, 9, 0, 1, 10), 1, AckMode::Written, tag(6, u32::MAX - 3))
            .await;
        assert!(matches!(e, Err(StorageError::SequenceTooOld { .. })));
        let out =
            log.append_tagged(S0, &recs(6, 2, 0, 1, 10), 1, AckMode::Written, tag(6, 2)).await;
        assert_eq!(out.unwrap(), appended(5, 1));
    });
}

#[test]
fn a_reopen_rebuilds_the_tables_across_many_segment_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = small_config(&path);
        let log = open(&path, &config).await;
        const PRODUCERS: u64 = 5;
        // (shard, producer) -> outcomes by seq
        let mut outcomes: Vec<Vec<AppendOutcome>> = vec![Vec::new(); 2 * PRODUCERS as usize];
        let mut round = 0u32;
        while log.segment_count() < 6 {
            for (si, shard) in SHARDS.iter().enumerate() {
                for p in 0..PRODUCERS {
                    let n = 1 + ((round as u64 + p) % 3) as usize;
                    let r = recs(p, round, 0, n, 20_000);
                    let out = log
                        .append_tagged(*shard, &r, 1, AckMode::Written, tag(p, round))
                        .await
                        .unwrap();
                    outcomes[si * PRODUCERS as usize + p as usize].push(out);
                }
                log.append(*shard, &recs(99, round, 0, 1, 1000), 1, AckMode::None).await.unwrap();
            }
            round += 1;
        }
        assert!(round as usize > PRODUCER_SEQ_WINDOW);
        log.clone().close().await.unwrap();
        let next: Vec<Offset> = SHARDS.iter().map(|s| log.next_offset(*s).unwrap()).collect();
        drop(log);
        let log = open(&path, &config).await;
        let appends_before = log.stats().appends;
        for (si, shard) in SHARDS.iter().enumerate() {
            for p in 0..PRODUCERS {
                let outs = &outcomes[si * PRODUCERS as usize + p as usize];
                for seq in round - PRODUCER_SEQ_WINDOW as u32..round {
                    let want = outs[seq as usize];
                    let r = recs(p, seq, 1, want.record_count as usize, 10);
                    let out = log.append_tagged(*shard, &r, 1, AckMode::Durable, tag(p, seq)).await;
                    assert_eq!(out.unwrap(), duplicate(want.base_offset.0, want.record_count));
                }
                let old = round - PRODUCER_SEQ_WINDOW as u32 - 1;
                let e = log
                    .append_tagged(*shard, &recs(p, old, 1, 1, 10), 1, AckMode::None, tag(p, old))
                    .await;
                assert!(matches!(e, Err(StorageError::SequenceTooOld { .. })));
            }
            assert_eq!(log.next_offset(*shard).unwrap(), next[si], "retries stored nothing");
        }
        assert_eq!(log.stats().appends, appends_before);
        // Reads after the reopen carry the tags.
        let b = log.read(ShardId(1), outcomes[PRODUCERS as usize + 2][3].base_offset, 1).await;
        assert_eq!(b.unwrap()[0].producer, tag(2, 3));
        for p in 0..PRODUCERS {
            let out = log
                .append_tagged(S0, &recs(p, round, 0, 1, 10), 1, AckMode::Written, tag(p, round))
                .await;
            assert!(!out.unwrap().duplicate);
        }
    });
}

#[test]
fn a_truncation_forgets_the_batches_it_cut_also_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let config = StorageConfig::new(&path);
        let log = open(&path, &config).await;
        let w = AckMode::Written;
        for seq in 0..6u32 {
            let out = log.append_tagged(S0, &recs(7, seq, 0, 2, 10), 1, w, tag(7, seq)).await;
            assert_eq!(out.unwrap(), appended(u64::from(seq) * 2, 2));
        }
        // Cut at a batch boundary: seqs 3, 4, 5 (offsets 6..12) are gone.
        log.truncate_shard(S0, Offset(6)).await.unwrap();
        // Rule: the producer's last stored batch is 2, so 4 is ahead of the next (3), and 3
        // is appended as new data at the cut; 2 is still a duplicate.
        let e = log.append_tagged(S0, &recs(7, 4, 1, 2, 10), 1, w, tag(7, 4)).await;
        assert!(matches!(e, Err(StorageError::OutOfOrderSequence { expected: 3, got: 4, .. })));
        let out = log.append_tagged(S0, &recs(7, 2, 1, 2, 10), 1, w, tag(7, 2)).await;
        assert_eq!(out.unwrap(), duplicate(4, 2));
        let out = log.append_tagged(S0, &recs(7, 3, 1, 2, 10), 1, w, tag(7, 3)).await;
        assert_eq!(out.unwrap(), appended(6, 2));
        let out = log.append_tagged(S0, &recs(7, 4, 1, 2, 10), 1, w, tag(7, 4)).await;
        assert_eq!(out.unwrap(), appended(8, 2));
        // Cut inside seq 4's batch (offsets 8..10): the batch is no longer whole, so it is
        // forgotten and its retry is stored again from the cut.
        log.truncate_shard(S0, Offset(9)).await.unwrap();
        let out = log.append_tagged(S0, &recs(7, 4, 2, 2, 10), 1, w, tag(7, 4)).await;
        assert_eq!(out.unwrap(), appended(9, 2));
        // Another producer whose every batch is cut becomes unknown: it may start anywhere.
        let out = log.append_tagged(S0, &recs(8, 0, 0, 1, 10), 1, w, tag(8, 0)).await;
        assert_eq!(out.unwrap(), appended(11, 1));
        log.truncate_shard(S0, Offset(11)).await.unwrap();
        let out = log.append_tagged(S0, &recs(8, 50, 0, 1, 10), 1, w, tag(8, 50)).await;
        assert_eq!(out.unwrap(), appended(11, 1));
        log.clone().close().await.unwrap();
        drop(log);
        // The rebuilt tables apply the markers in log order: the same answers.
        let log = open(&path, &config).await;
        let expect = [(7, 2, 4), (7, 3, 6), (7, 4, 9), (8, 50, 11)];
        for (p, seq, base) in expect {
            let out = log
                .append_tagged(S0, &recs(p, seq, 3, 2 - (p == 8) as usize, 10), 1, w, tag(p, seq))
                .await;
            assert_eq!(out.unwrap(), duplicate(base, 2 - (p == 8) as u32), "{p}/{seq}");
        }
        let e = log.append_tagged(S0, &recs(8, 0, 1, 1, 10), 1, w, tag(8, 0)).await;
        assert!(matches!(e, Err(StorageError::SequenceTooOld { oldest_kept: 50, .. })), "{e:?}");
        let e = log.append_tagged(S0, &recs(7, 6, 1, 2, 10), 1, w, tag(7, 6)).await;
        assert!(matches!(e, Err(StorageError::OutOfOrderSequence { expected: 5, .. })), "{e:?}");
        let values: Vec<Vec<Record>> =
            read_all(&log, S0).await.into_iter().map(|b| b.records).collect();
        assert_eq!(values.len(), 7);
        assert_eq!(values[3], recs(7, 3, 1, 2, 10));
        assert_eq!(values[4], recs(7, 4, 1, 2, 10)[..1].to_vec(), "trimmed by the cut at 9");
        assert_eq!(values[5], recs(7, 4, 2, 2, 10));
        // Truncating everything forgets every producer.
        log.truncate_shard(S0, Offset(0)).await.unwrap();
        assert_eq!(log.producer_count(S0).unwrap(), 0);
        let out = log.append_tagged(S0, &recs(7, 2, 9, 2, 10), 1, w, tag(7, 2)).await;
        assert_eq!(out.unwrap(), appended(0, 2));
    });
}

#[test]
fn the_table_is_bounded_and_evicts_the_producer_that_appended_longest_ago() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut config = StorageConfig::new(&path);
        config.producers_per_shard_max = 0;
        let e = StreamLog::open("t/ns/p", &path.join("log"), &SHARDS, &config, Default::default())
            .await;
        assert!(matches!(e, Err(StorageError::InvalidConfig { .. })));
        config.producers_per_shard_max = 4;
        let log = open(&path, &config).await;
        let w = AckMode::Written;
        for p in 1..=4u64 {
            log.append_tagged(S0, &recs(p, 0, 0, 1, 10), 1, w, tag(p, 0)).await.unwrap();
        }
        log.append_tagged(S0, &recs(1, 1, 0, 1, 10), 1, w, tag(1, 1)).await.unwrap();
        // A retry is not an append: producer 2 stays the oldest.
        let out = log.append_tagged(S0, &recs(2, 0, 1, 1, 10), 1, w, tag(2, 0)).await;
        assert!(out.unwrap().duplicate);
        assert_eq!(log.producer_count(S0).unwrap(), 4);
        log.append_tagged(S0, &recs(5, 0, 0, 1, 10), 1, w, tag(5, 0)).await.unwrap();
        assert_eq!(log.producer_count(S0).unwrap(), 4);
        assert_eq!(log.stats().producers_evicted, 1);
        // Producer 2 is unknown again: its retry is stored as new (documented).
        let out = log.append_tagged(S0, &recs(2, 0, 2, 1, 10), 1, w, tag(2, 0)).await;
        assert_eq!(out.unwrap(), appended(6, 1));
        assert_eq!(log.stats().producers_evicted, 2, "producer 3 made room");
        for (p, seq, base) in [(1, 1, 4), (4, 0, 3), (5, 0, 5)] {
            let out = log.append_tagged(S0, &recs(p, seq, 1, 1, 10), 1, w, tag(p, seq)).await;
            assert_eq!(out.unwrap(), duplicate(base, 1), "producer {p}");
        }
        // Other shards have their own tables.
        assert_eq!(log.producer_count(ShardId(1)).unwrap(), 0);
        // A reopen rebuilds within the same bound.
        log.clone().close().await.unwrap();
        drop(log);
        let log = open(&path, &config).await;
        assert_eq!(log.producer_count(S0).unwrap(), 4);
        let out = log.append_tagged(S0, &recs(3, 0, 1, 1, 10), 1, w, tag(3, 0)).await;
        assert!(!out.unwrap().duplicate, "producer 3 was evicted before the reopen too");
    });
}

/// A producer's stored batches as (seq, base offset, record count), oldest first, and the
/// model's append count at its last append.
type ModelProducer = (Vec<(u32, u64, u32)>, u64);

/// A model of one shard: every stored batch, and per producer its batches, in order.
#[derive(Default)]
struct Model {
    records: Vec<Record>,
    /// The producers remembered (forgotten ones are removed, as the table evicts them).
    producers: std::collections::HashMap<u64, ModelProducer>,
    appends: u64,
}

/// What the rules of docs/storage-format.md say about an offer.
#[derive(Debug, PartialEq)]
enum Expect {
    Append,
    Duplicate(u64, u32),
    Mismatch,
    OutOfOrder(u32),
    TooOld(u32),
}

impl Model {
    fn expect(&self, producer: u64, seq: u32, count: u32) -> Expect {
        let Some((window, _)) = self.producers.get(&producer) else { return Expect::Append };
        let window = &window[window.len().saturating_sub(PRODUCER_SEQ_WINDOW)..];
        if let Some((_, base, n)) = window.iter().find(|(s, _, _)| *s == seq) {
            return if *n == count { Expect::Duplicate(*base, *n) } else { Expect::Mismatch };
        }
        let next = window.last().expect("known producers have batches").0.wrapping_add(1);
        match seq.wrapping_sub(next) {
            0 => Expect::Append,
            d if d < 1 << 31 => Expect::OutOfOrder(next),
            _ => Expect::TooOld(window[0].0),
        }
    }

    fn append(&mut self, producer: u64, seq: u32, records: Vec<Record>, max: usize) {
        let base = self.records.len() as u64;
        let count = records.len() as u32;
        self.records.extend(records);
        self.appends += 1;
        if !self.producers.contains_key(&producer) && self.producers.len() == max {
            let oldest = *self.producers.iter().min_by_key(|(_, (_, at))| *at).unwrap().0;
            self.producers.remove(&oldest);
        }
        let entry = self.producers.entry(producer).or_default();
        entry.0.push((seq, base, count));
        entry.1 = self.appends;
    }
}

/// Random offers (next, retries of remembered and forgotten batches, gaps, wrong counts) by
/// a few producers against a small table, compared with the model; then again after a
/// reopen. Seeded; the seed is printed on failure.
#[test]
fn random_offers_match_a_model_before_and_after_a_reopen() {
    let seed: u64 = std::env::var("FELIX_PRODUCER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    println!("seed {seed} (FELIX_PRODUCER_SEED={seed} to repeat)");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    run(move || async move {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut config = StorageConfig::new(&path);
        config.producers_per_shard_max = 3;
        let mut log = open(&path, &config).await;
        let mut model = Model::default();
        // Each producer's next sequence number as its client sees it.
        let mut next_seq = [u32::MAX - 20, 0, 1000, 5, 77];
        for step in 0..1500u32 {
            if step == 1000 {
                log.clone().close().await.unwrap();
                drop(log);
                log = open(&path, &config).await;
            }
            let p = rng.gen_range(0..next_seq.len());
            let seq = match rng.gen_range(0..10) {
                0..=4 => next_seq[p],
                5..=7 => next_seq[p].wrapping_sub(rng.gen_range(1..12)),
                _ => next_seq[p].wrapping_add(rng.gen_range(1..3)),
            };
            let count = model
                .producers
                .get(&(p as u64))
                .and_then(|(w, _)| w.iter().find(|e| e.0 == seq))
                .map_or(rng.gen_range(1..4), |e| e.2 + u32::from(rng.gen_ratio(1, 10)));
            let r = recs(p as u64, seq, step, count as usize, 8);
            let ack = [AckMode::None, AckMode::Written, AckMode::Durable][rng.gen_range(0..3)];
            let expect = model.expect(p as u64, seq, count);
            let got = log.append_tagged(S0, &r, 1, ack, tag(p as u64, seq)).await;
            match (&expect, got) {
                (Expect::Append, Ok(out)) => {
                    assert_eq!(out, appended(model.records.len() as u64, count), "seed {seed}");
                    model.append(p as u64, seq, r, config.producers_per_shard_max);
                    if seq == next_seq[p] {
                        next_seq[p] = seq.wrapping_add(1);
                    }
                }
                (Expect::Duplicate(base, n), Ok(out)) => assert_eq!(out, duplicate(*base, *n)),
                (Expect::Mismatch, Err(StorageError::SequenceMismatch { .. })) => {}
                (Expect::OutOfOrder(e), Err(StorageError::OutOfOrderSequence { expected, .. }))
                    if *e == expected => {}
                (Expect::TooOld(o), Err(StorageError::SequenceTooOld { oldest_kept, .. }))
                    if *o == oldest_kept => {}
                (want, got) => panic!("seed {seed} step {step}: want {want:?}, got {got:?}"),
            }
        }
        // A last `AckMode::None` append may still be queued: a flush covers only what is
        // written, so wait for its records first.
        if let Some(last) = (model.records.len() as u64).checked_sub(1) {
            log.wait_for(S0, Offset(last)).await.unwrap();
        }
        log.flush().await.unwrap();
        let stored: Vec<Record> =
            read_all(&log, S0).await.into_iter().flat_map(|b| b.records).collect();
        assert!(stored == model.records, "seed {seed}: stored records differ from the model");
        assert!(log.producer_count(S0).unwrap() <= 3);
    });
}
