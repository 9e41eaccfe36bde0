//! criterion benches: durable appends of 64 x 4 KiB batches through one stream log with
//! 1 and 16 concurrent appenders (one executor, data in a temp dir on the real disk), and
//! the pure per-shard index lookup. bench/storage.sh has the pinned, fio-compared figures.

use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use felix_proto::{AckMode, Record, ShardId};
use felix_storage::index::{IndexEntry, ShardIndex};
use felix_storage::{RetentionConfig, StorageConfig, StreamLog};
use glommio::{LocalExecutorBuilder, Placement};

const RECORDS: usize = 64;
const RECORD_BYTES: usize = 4096;

fn durable_appends(appenders: usize, iters: u64) -> Duration {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().to_owned();
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(move || async move {
            let config = StorageConfig::new(&path);
            let (log, _) = StreamLog::open(
                "bench/s",
                &path,
                &[ShardId(0)],
                &config,
                RetentionConfig::default(),
            )
            .await
            .expect("open");
            let value = Bytes::from(vec![7u8; RECORD_BYTES]);
            let batch: Rc<Vec<Record>> =
                Rc::new((0..RECORDS).map(|_| Record::unkeyed(value.clone())).collect());
            let per = iters.div_ceil(appenders as u64);
            let start = Instant::now();
            let tasks: Vec<_> = (0..appenders)
                .map(|_| {
                    let (log, batch) = (log.clone(), batch.clone());
                    glommio::spawn_local(async move {
                        for _ in 0..per {
                            log.append(ShardId(0), &batch, 0, AckMode::Durable)
                                .await
                                .expect("append");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
            start.elapsed()
        })
        .expect("executor")
        .join()
        .expect("join")
}

fn bench_append(c: &mut Criterion) {
    let mut g = c.benchmark_group("durable_append_64x4KiB");
    g.throughput(Throughput::Bytes((RECORDS * RECORD_BYTES) as u64));
    // Short windows keep each sample's log small (about 0.2 s of appends, < 200 MB):
    // this VM slows down sharply once the page cache has grown by several GB.
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(2));
    for appenders in [1usize, 16] {
        g.bench_function(format!("{appenders}_appenders"), |b| {
            b.iter_custom(|iters| durable_appends(appenders, iters))
        });
    }
    g.finish();
}

fn bench_index(c: &mut Criterion) {
    let mut ix = ShardIndex::new(0);
    for i in 0..4096u64 {
        ix.push(IndexEntry {
            base_offset: i * 64,
            record_count: 64,
            len: 262_768,
            position: i * 270_000,
        });
    }
    c.bench_function("index_lookup_dense_4096", |b| {
        let mut k = 0u64;
        b.iter(|| {
            k = (k + 7919) % (4096 * 64);
            criterion::black_box(ix.lookup(k, 1 << 20))
        })
    });
}

criterion_group!(benches, bench_append, bench_index);
criterion_main!(benches);
